"""Amaranth side-by-side benchmark harness (`python3 -m bench --help`)."""
