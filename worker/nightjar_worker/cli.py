"""``nightjar-worker``: ``serve`` (the API server), ``demo`` (low -> high -> low load), ``profile``.

Sub-command modules are imported lazily: ``serve`` must set ``PROMETHEUS_MULTIPROC_DIR`` before
vLLM or ``prometheus_client`` is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: nightjar-worker {serve,demo,profile} [options]

  serve    vLLM's OpenAI API server with Nightjar (see `nightjar-worker serve --help`)
  demo     start the worker on the bundled pair and drive low -> high -> low load
  profile  measure T(batch, gamma) and acceptance, write the cost-profile JSON
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "serve":
        from nightjar_worker.serve import main as serve_main

        return serve_main(rest)
    if cmd == "demo":
        from nightjar_worker.demo import main as demo_main

        return demo_main(rest)
    if cmd == "profile":
        try:
            from nightjar_worker.profiler import main as profile_main
        except ImportError as e:
            print(f"nightjar-worker profile: the profiler is not available ({e})", file=sys.stderr)
            return 1
        return profile_main(rest)
    print(f"nightjar-worker: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
