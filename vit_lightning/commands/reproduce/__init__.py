"""`vit-ablate reproduce`: a published table measured again with published weights, evaluation only; it trains
nothing and reads no ablation's records."""
