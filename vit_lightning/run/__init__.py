"""One run's machinery, bottom to top: its directory (rundir: lock, record, checkpoints), where it starts from
(transfer), the LightningModule (module), and what `fit` attaches (callbacks, record, hyperband, loggers).
Imports the model, the data and the vocabulary floor; never the analyses, the commands or the sweeps."""
