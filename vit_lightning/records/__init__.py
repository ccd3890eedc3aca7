"""Run records read back for the tables: the store of an ablation's records, their checks, data frames, the
statistics (Welch, Holm, TOST) and the markdown they are rendered in. Imports run/ and the floors below it."""
