"""The harness tests itself: deliberately broken backends (mutants) every check must catch."""
