"""``mmaemit`` command line: ``demo`` (the main job) and ``table`` (the instruction table as Markdown)."""
from __future__ import annotations

import argparse
import sys


def _cmd_table(args) -> int:
    from . import isa

    print(isa.markdown_table())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mmaemit", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("table", help="print the mma.sync instruction table")
    p.set_defaults(func=_cmd_table)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
