"""The data: the datasets a run can train on (the embedded mnist5k, CIFAR, image folders, synthetic) and their
loaders and augmentation. Imports only the vocabulary floor (bookkeeping, identity, compat)."""
