"""Service memory under varied input: the tokenizer's word cache is bounded, glibc's mmap threshold fixed."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Encodes 60,000 distinct random words (seeded) in a fresh process and prints its RSS growth in MiB.
_GROWTH_SCRIPT = """
import random, sys
from pathlib import Path
from slimserve.tokenization import load_tokenizer
from tokenizers import Tokenizer

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

path = Path(sys.argv[1])
tokenizer = load_tokenizer(path) if sys.argv[2] == "bounded" else Tokenizer.from_file(str(path))
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz\\u00e9\\u00fc\\u6f22\\u5b57"
tokenizer.encode("warm up the allocator " * 50)
start = rss_mib()
for _ in range(1200):
    words = ("".join(rng.choice(letters) for _ in range(rng.randint(3, 200))) for _ in range(50))
    tokenizer.encode(" ".join(words))
print(rss_mib() - start)
"""


def _growth_mib(tokenizer_file, mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _GROWTH_SCRIPT, str(tokenizer_file), mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm (Linux only)")
def test_word_cache_is_bounded_under_varied_input():
    from slimserve.models.teacher import TeacherError, default_tokenizer_file

    try:
        tokenizer_file = default_tokenizer_file()
    except (TeacherError, ImportError) as exc:
        pytest.skip(f"SmolLM2 tokenizer unavailable: {exc}")
    unbounded = _growth_mib(tokenizer_file, "default")
    bounded = _growth_mib(tokenizer_file, "bounded")
    # The library's default cache keeps 10,000 words: about 25 MiB here. Bounded, a few MiB at most.
    assert unbounded > 12, f"the check no longer exercises the cache: default growth {unbounded:.1f} MiB"
    assert bounded < 6, f"bounded tokenizer grew {bounded:.1f} MiB (default {unbounded:.1f} MiB)"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_services_fix_glibc_mmap_threshold():
    from slimserve.serving.allocator import fix_mmap_threshold

    assert fix_mmap_threshold() is True
