"""TensorBoard summaries: the one writer (and reader) of keras_scaling's event files.

`_tensorboard` writes scalars, text, images and the Custom Scalars layout
into one event file per run directory and process (`log_dir/scaling`
beside Keras' `log_dir/train`), checks a log directory before training
starts, and reads event files back for the tests and `keras-scaling report`.
"""
