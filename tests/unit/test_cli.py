"""The command line as a user meets it: contracts, exit codes, bad input, partial data."""

from __future__ import annotations


def test_every_option_with_a_default_says_it_in_its_help() -> None:
    """`--help` names each option's default (`export --format` did not)."""
    import argparse

    from traceview.cli import build_parser

    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, child in sub.choices.items():
        for action in child._actions:
            default = action.default
            if (
                not action.option_strings
                or action.nargs == 0  # flags: store_true and the like
                or default in (None, argparse.SUPPRESS)
            ):
                continue
            text = action.help or ""
            if "default" not in text and f"{default}" not in text:
                missing.append(f"{name} {action.option_strings[-1]} (default {default!r})")
    assert not missing, missing
