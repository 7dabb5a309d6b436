"""Root pytest configuration of this repository's own test suite.

The harness plugin (options, markers, seeds, Hypothesis profiles, ``--parity-report``) is loaded by
the ``pytest11`` entry point of the installed ``moe-fq-parity`` distribution, here as in any other
project that installs it; nothing needs to be listed here.
"""
