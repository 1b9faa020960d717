"""`ftsup`: one entry point for the daemons and the tools (supervisor, agent, demo)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def _supervisor(argv: list[str]) -> int:
    from supervisor.main import main

    return main(argv)


def _agent(argv: list[str]) -> int:
    from agent.main import main

    return main(argv)


def _demo(argv: list[str]) -> int:
    from harness.demo import main

    return main(argv)


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "supervisor": (_supervisor, "run the supervisor daemon"),
    "agent": (_agent, "run the node agent daemon"),
    "demo": (_demo, "train on a local cluster, kill a node, recover (see --help)"),
}


def usage() -> str:
    lines = ["usage: ftsup COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\n`ftsup COMMAND --help` for a command's flags; `supervisorctl --help` for the operator CLI.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command = SUBCOMMANDS.get(args[0])
    if command is None:
        print(f"ftsup: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return command[0](args[1:])


if __name__ == "__main__":
    sys.exit(main())
