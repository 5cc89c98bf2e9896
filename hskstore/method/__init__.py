"""The method's pure functions (docs/METHOD.md): depth (which teacher layers serve which student entries) and
length and width selection. Import the format only: the dump, derive and online training all call them."""
