"""Students and what a student is made of: the named students, their heads, their forward under fixed output
keys (the adapter), PEA-KD's shared-parameter students and ROSITA's pruned ones."""
