"""Tools on finished stores: bundles (`hsk pack`), the catalog, exports (Parquet, datasets) and derive (a
smaller config's store without the teacher). May import every other layer; nothing in hskstore imports it."""
