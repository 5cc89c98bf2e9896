"""Loss terms (every registered name's implementation) and the method maths they read: layer pairs,
TinyBERT's attention scores, PEA-KD's PTP labels."""
