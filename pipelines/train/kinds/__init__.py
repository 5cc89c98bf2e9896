"""The kinds of training run, each its own parts around the one loop (pipelines.train.run): `hsk train`
(distill, and LightPAFF pre-training on a masked-LM store), `hsk teacher` and the masked-LM teacher."""
