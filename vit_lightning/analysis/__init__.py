"""Analyses of a trained run, bottom to top: the run loaded back (trained), few-shot probes (fewshot), the
shuffled-patch metric (shuffle) and evaluation on any data (evaluate). Imports run/, the model and the data;
`fit` (commands/fit) uses these for the numbers it records at the end of a run."""
