"""Ground-truth pairwise conditional MI of an MDM by probing (`exact`), and the exact MI of Sudoku contexts from
their completions (`sudoku_mi`)."""
