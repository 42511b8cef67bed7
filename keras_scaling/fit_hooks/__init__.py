"""How keras_scaling's callbacks hook into `fit`: train-function wrappers, undos however it ends, counters."""
