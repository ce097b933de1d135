"""The reasoning subcommands of ``slimserve``: ``serve-reasoning``, ``explain``, ``generate``.

Thin layers over ``slimserve.serving.reasoning.server`` and ``slimserve.reasoning_client``; added to the
parser by ``slimserve.cli``.
"""

from __future__ import annotations

import argparse
import sys

from .channel import add_client_security_flags, security_from_args

EXIT_OK = 0
DEFAULT_TARGET = "127.0.0.1:50052"


def add_reasoning_commands(sub) -> None:
    """Register the reasoning subcommands on the ``slimserve`` subparsers."""
    from .serving.reasoning.config import ReasoningServiceConfig
    from .settings import add_config_arguments

    serve = sub.add_parser("serve-reasoning", help="run the reasoning gRPC service against a running Triton")
    add_config_arguments(serve, ReasoningServiceConfig)
    serve.set_defaults(handler=_run_serve_reasoning)

    explain = sub.add_parser("explain", help="stream an explanation of why an item suits a member")
    explain.add_argument("--member", help="member as JSON (inline or a file); default: the built-in example")
    explain.add_argument("--item", help="item as JSON (inline or a file); default: a built-in example job")
    explain.add_argument("--example-item", type=int, default=0, help="which built-in example job (0, 1, ...)")
    _add_client_flags(explain)
    explain.set_defaults(handler=_run_explain)

    generate = sub.add_parser("generate", help="stream the generator's answer to a prompt")
    generate.add_argument("--prompt", required=True, help="the user's text (wrapped in the chat format)")
    _add_client_flags(generate)
    generate.set_defaults(handler=_run_generate)


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="reasoning service address host:port")
    parser.add_argument("--max-tokens", type=int, default=0, help="most tokens to generate (0: the default)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1]")
    parser.add_argument("--seed", type=int, help="sampler seed (same seed, same text)")
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        help="penalty >= 1 on tokens already generated (default: the service's, 1 for explain, 1.15 for "
        "generate; 1 = off)",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        help="a stop string (repeatable; \\n and \\t mean newline, tab)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    parser.add_argument("--request-id", default="", help="request id for logs and metadata")
    add_client_security_flags(parser)


def _options(args: argparse.Namespace):
    from .reasoning_client import build_options

    stops = [stop.replace("\\n", "\n").replace("\\t", "\t") for stop in args.stop]
    return build_options(
        args.max_tokens, args.temperature, args.top_p, args.seed, stops, args.repetition_penalty
    )


def _stream(args: argparse.Namespace, request) -> int:
    from .reasoning_client import format_metadata, stream_text

    metadata = stream_text(args.target, request, timeout_s=args.timeout, security=security_from_args(args))
    sys.stdout.write("\n\n" + format_metadata(metadata) + "\n")
    return EXIT_OK


def _run_serve_reasoning(args: argparse.Namespace) -> int:
    from .serving.reasoning.config import ReasoningServiceConfig
    from .serving.reasoning.server import run_reasoning_service
    from .settings import config_from_args

    run_reasoning_service(config_from_args(ReasoningServiceConfig, args, args.config))
    return EXIT_OK


def _run_explain(args: argparse.Namespace) -> int:
    from .reasoning_client import explain_request, load_explain_input

    member, item = load_explain_input(args.member, args.item, args.example_item)
    sys.stdout.write(f"Why {item.title} at {item.company} for member {member.id}:\n\n")
    return _stream(args, explain_request(member, item, _options(args), args.request_id))


def _run_generate(args: argparse.Namespace) -> int:
    from .reasoning_client import generate_request

    return _stream(args, generate_request(args.prompt, _options(args), args.request_id))
