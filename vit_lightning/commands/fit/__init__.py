"""`vit-ablate fit`: one run, from its options (cli) and checks (settings) to its start and stop (main)."""
