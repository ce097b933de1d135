"""Pairs with their skills renamed to real skills the synthetic dataset never uses.

A generator student distilled only on the dataset's 65 skills learns to recall those names, not to copy
the pair's: given a member with ``grpc`` and ``postgresql`` it wrote "you have python, crm and postear".
Explanation prompts whose skills are renamed (consistently within a pair: a shared skill stays shared)
teach it to copy what the facts say. The demo's skills outside the dataset (``slimserve.examples``) are
left out of this list on purpose, so the demo stays a check on skills the student has never seen.

``HELD_OUT_SKILLS`` are in neither list (the demo's among them): the build's evaluation renames held-out
pairs to them, so its grounding figures on those pairs measure copying names no training prompt had.

A fixed list can still be recalled rather than copied: a student renamed to these 140 names alone wrote
"kurenetes", "opentele" and "spess" for held-out names and named every shared skill of a full match in 0
of 12 such pairs (docs/generator-build.md). ``invented_skill`` makes names no list holds (random
syllables, now and then a familiar ending: "vorlakdb", "plinex ops"), a fresh set per pair, so the
only way to write them is to copy them from the prompt.

Titles, too: the dataset's activity titles are two words ("Backend Developer"), and a student trained on
those alone wrote "You recently looked at a Senior Developer role" for the demo's "Senior Python
Developer". ``varied_titles`` gives a pair's history titles a level and a domain word ("Lead Payments
Backend Developer"), from ``TITLE_WORDS`` for training prompts and ``HELD_OUT_TITLE_WORDS`` for the
evaluation's unseen pairs. The demo's "Python" is in neither list.
"""

from __future__ import annotations

import random
from dataclasses import replace

from .splits import Example
from .vocab import SKILLS as DATASET_SKILLS

RENAMING_SKILLS: tuple[str, ...] = (
    # software and data
    "c++", "c#", "kotlin", "swift", "scala", "ruby", "php", "elixir", "haskell", "perl", "bash",
    "graphql", "rest apis", "kafka", "rabbitmq", "redis", "mongodb", "cassandra", "elasticsearch",
    "mysql", "snowflake", "bigquery", "dbt", "hadoop", "flink", "tensorflow", "jax", "scikit-learn",
    "pandas", "numpy", "computer vision", "nlp", "reinforcement learning", "data visualization",
    "power bi", "looker", "matlab", "ansible", "jenkins", "github actions", "azure",
    "google cloud", "linux", "networking", "cybersecurity", "penetration testing", "unity", "vue",
    "angular", "node.js", "django", "flask", "spring", "android", "ios", "embedded c", "fpga",
    # design and marketing
    "sketch", "after effects", "indesign", "motion design", "ux writing", "accessibility",
    "content strategy", "public relations", "market research", "brand strategy", "video editing",
    "photography", "hubspot", "marketo", "affiliate marketing", "community management",
    # business, finance, operations, sales
    "account management", "business development", "contract law", "compliance", "risk management",
    "payroll", "accounts payable", "gaap", "valuation", "treasury", "quickbooks", "netsuite",
    "supply chain", "warehousing", "six sigma", "kaizen", "quality assurance", "vendor management",
    "customer success", "zendesk", "okrs", "stakeholder management", "change management",
    "project management", "jira", "product management", "pricing", "recruiting", "onboarding",
    # health and education
    "phlebotomy", "wound care", "radiology", "physiotherapy", "nutrition", "telehealth",
    "medical coding", "iv therapy", "special education", "tutoring", "instructional design",
    "early childhood education", "assessment design", "stem outreach", "sign language",
    # trades and languages
    "welding", "carpentry", "cad", "autocad", "solidworks", "plc programming", "hvac",
    "electrical wiring", "forklift operation", "spanish", "french", "mandarin", "arabic", "german",
)  # fmt: skip


# Skills no training prompt uses (neither the dataset nor RENAMING_SKILLS), the demo's first; long and
# multi-token names on purpose (the student garbled "postgresql" into "postql").
HELD_OUT_SKILLS: tuple[str, ...] = (
    "grpc", "postgresql", "prometheus", "terraform", "css", "information retrieval",
    "webassembly", "clickhouse", "opentelemetry", "istio", "nginx", "dynamodb", "sqlite", "fortran",
    "cobol", "erlang", "ocaml", "flutter", "svelte", "tailwind", "blender", "premiere pro", "grafana",
    "kubeflow", "mlflow", "onnx", "cuda", "protobuf", "webpack", "prisma", "neo4j", "memcached",
    "zookeeper", "pulumi", "argo cd", "datadog", "splunk", "alteryx", "stata", "spss", "xero",
    "anesthesia", "dialysis", "oncology", "pediatrics", "sonography", "montessori", "braille",
    "cnc machining", "pipefitting", "plumbing", "solar installation", "japanese", "korean",
    "portuguese", "swahili",
)  # fmt: skip


_ONSETS = ("b", "br", "d", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "pl", "qu", "r", "s", "sk", "st",
           "t", "tr", "v", "z", "x", "sh", "ch", "th", "w", "j")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "y", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "s", "x", "l", "m", "k", "t", "nd")
_ENDINGS = ("db", "ql", ".js", "script", "flow", "ware", "ops", " ops", " analytics", " design", " care",
            " modeling", " testing", " studio", " cloud", " therapy")  # fmt: skip


def invented_skill(rng: random.Random) -> str:
    """A skill-like name of 2-3 random syllables, a third of them with a familiar ending (seeded)."""
    syllables = rng.randint(2, 3)
    name = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return name + rng.choice(_ENDINGS) if rng.random() < 1 / 3 else name


# Names an invented one must not be: every listed skill and every skill of the dataset.
_KNOWN_SKILLS = frozenset(s.lower() for s in (*RENAMING_SKILLS, *HELD_OUT_SKILLS, *DATASET_SKILLS))


def invented_skills(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct invented names, none a known skill (listed or the dataset's)."""
    names: list[str] = []
    while len(names) < count:
        name = invented_skill(rng)
        if name not in _KNOWN_SKILLS and name not in names:
            names.append(name)
    return names


def renamed_skills(
    example: Example, rng: random.Random, names: tuple[str, ...] | None = RENAMING_SKILLS
) -> Example:
    """``example`` with each distinct skill of the pair (member's and item's) replaced by a different
    skill of ``names``, the same everywhere it appears; ``names`` None: fresh invented names
    (``invented_skills``)."""
    skills = sorted(set(example.member.skills) | set(example.item.required_skills))
    new_names = invented_skills(rng, len(skills)) if names is None else rng.sample(names, len(skills))
    mapping = dict(zip(skills, new_names, strict=True))
    member = replace(example.member, skills=tuple(mapping[s] for s in example.member.skills))
    item = replace(example.item, required_skills=tuple(mapping[s] for s in example.item.required_skills))
    return replace(example, member=member, item=item)


def with_renamed_share(
    examples: list[Example], share: float, seed: int, invented_share: float = 0.0
) -> list[Example]:
    """``examples`` in order, every one whose seeded draw falls below ``share`` with renamed skills:
    invented names (``invented_skills``) for an ``invented_share`` of those, ``RENAMING_SKILLS`` else."""
    rng = random.Random(seed)
    renamed = []
    for example in examples:
        if rng.random() < share:
            invented = invented_share > 0 and rng.random() < invented_share
            names = None if invented else RENAMING_SKILLS
            example = renamed_skills(example, rng, names)
        renamed.append(example)
    return renamed


def renamed_copies(examples: list[Example], copies: int, seed: int) -> list[Example]:
    """``copies`` renamed copies of ``examples``: all of them with the renaming list's names, then all
    with invented names, in turn (seeded)."""
    rng = random.Random(seed)
    return [
        renamed_skills(example, rng, RENAMING_SKILLS if copy % 2 == 0 else None)
        for copy in range(copies)
        for example in examples
    ]


TITLE_LEVELS: tuple[str, ...] = ("Senior", "Lead", "Junior", "Staff", "Principal", "Associate")
TITLE_WORDS: tuple[str, ...] = (
    "Cloud", "Payments", "Mobile", "Platform", "Clinical", "Growth", "Security", "Partner", "Enterprise",
    "Regional", "Digital", "Global", "Integration", "Marketing", "Infrastructure", "Product", "Research", "Field",
)  # fmt: skip
HELD_OUT_TITLE_WORDS: tuple[str, ...] = (
    "Satellite", "Quantum", "Aerospace", "Streaming", "Robotics", "Audio", "Gaming", "Wearables",
)  # fmt: skip


def varied_title(title: str, rng: random.Random, words: tuple[str, ...] = TITLE_WORDS) -> str:
    """``title`` with a level word, a domain word of ``words`` or both in front ("Lead Cloud Accountant")."""
    form = rng.randrange(3)
    level = rng.choice(TITLE_LEVELS) if form != 1 else ""
    word = rng.choice(words) if form != 0 else ""
    return " ".join(w for w in (level, word, title) if w)


def varied_titles(example: Example, rng: random.Random, words: tuple[str, ...] = TITLE_WORDS) -> Example:
    """``example`` with each distinct history title of its member varied (``varied_title``), the same
    title the same way everywhere it appears."""
    titles = sorted({a.item_title for a in example.member.history})
    mapping = {t: varied_title(t, rng, words) for t in titles}
    history = tuple(replace(a, item_title=mapping[a.item_title]) for a in example.member.history)
    return replace(example, member=replace(example.member, history=history))


def with_varied_titles(examples: list[Example], share: float, seed: int) -> list[Example]:
    """``examples`` in order, every one whose seeded draw falls below ``share`` with varied titles."""
    rng = random.Random(seed)
    return [varied_titles(e, rng) if rng.random() < share else e for e in examples]
