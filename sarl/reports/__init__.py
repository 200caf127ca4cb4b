"""Reports on trained policies: the held-out before/after evaluation (`heldout`), the comparison table of several
runs (`compare`), the paper's figures (`figures`)."""
