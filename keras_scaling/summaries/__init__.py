"""TensorBoard summaries: the one writer (and reader) of keras_scaling's event files."""
