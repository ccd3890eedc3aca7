"""timm's models into ours: each family's importer (vit, swin; eva for timm's RoPE ViTs) and the renaming of timm's
parameters to ours (names.py, names.yaml).

A floor below the families (core/floors.py): a family's entry names its importer, which reads our model through its
config and state dict only and imports nothing else of model/. build.load_timm_weights picks the importer by family.
"""
