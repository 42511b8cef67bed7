"""How keras_scaling's callbacks hook into `fit`: per-step work in a wrapper of the
train function, undoing their changes however `fit` ends, counting traces and steps."""
