"""The real-workload corpus: models people train, built tiny, and how they are trained.

Each model is built from a config with random weights and, where the
library has one, its preprocessor attached: keras-hub's `Task.fit` maps the
preprocessor over the dataset, so tokenizing and image conversion run in the
tf.data graph, and the model gets what the preprocessor emits (keras-hub's
text preprocessors emit a `bool` `padding_mask`). Nothing is downloaded: the
vocabularies and merges are written here.

Every model trains on the same plan: 64 samples, a global batch of 8 (4 per
replica on 2 replicas), 8 steps per epoch, 2 epochs, from
`keras_scaling.data.distribute`, with `ReplicaSyncCheck` and
`ThroughputLogger`.
"""

import dataclasses
import json
import os

import keras
import numpy as np

import keras_scaling

NUM_SAMPLES = 64
GLOBAL_BATCH_SIZE = 8
STEPS_PER_EPOCH = NUM_SAMPLES // GLOBAL_BATCH_SIZE  # 8
EPOCHS = 2
SEQUENCE_LENGTH = 8
DATA_SEED = 0

BERT_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "the",
    "quick",
    "brown",
    "fox",
    "jumped",
    "over",
    "lazy",
    "dog",
]
# A byte-pair vocabulary whose merges spell "air", "plane", "port" and "at",
# with and without the leading space ("Ġ").
GPT2_MERGES = [
    "a i",
    "ai r",
    "p l",
    "pl a",
    "n e",
    "pla ne",
    "p o",
    "r t",
    "po rt",
    "Ġ a",
    "Ġa t",
    "Ġa i",
    "Ġai r",
    "Ġ p",
    "Ġp l",
    "Ġpl a",
    "Ġpla ne",
    "Ġp o",
    "Ġpo rt",
]
GPT2_VOCABULARY = {
    token: index
    for index, token in enumerate(
        ["<|endoftext|>", "Ġ", "a", "i", "r", "p", "l", "n", "e", "o", "t"]
        + [merge.replace(" ", "") for merge in GPT2_MERGES]
    )
}
TEXT_WORDS = ["great", "fine", "good", "bad", "awful", "poor", "movie", "plot", "cast"]


def bert_data():
    """Sentences of the vocabulary's words; the label: whether "fox" is in it."""
    rng = np.random.default_rng(1)
    words = rng.choice(BERT_VOCABULARY[5:], size=(NUM_SAMPLES, 5))
    sentences = np.array([" ".join(row) for row in words])
    return sentences, (words == "fox").any(axis=1).astype("int32")


def make_bert_classifier():
    import keras_hub

    keras.utils.set_random_seed(0)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY),
        sequence_length=SEQUENCE_LENGTH,
    )
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(BERT_VOCABULARY),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=SEQUENCE_LENGTH,
    )
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def gpt2_data():
    """Texts of "air", "plane", "port" and "at"; the causal LM's preprocessor makes the targets."""
    rng = np.random.default_rng(2)
    words = rng.choice(["airplane", "airport", " at", " plane", " port", " air"], size=(64, 3))
    return np.array(["".join(row) for row in words])


def make_gpt2_causal_lm():
    import keras_hub

    keras.utils.set_random_seed(0)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(
        keras_hub.models.GPT2Tokenizer(vocabulary=GPT2_VOCABULARY, merges=GPT2_MERGES),
        sequence_length=SEQUENCE_LENGTH,
    )
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(GPT2_VOCABULARY),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=SEQUENCE_LENGTH,
    )
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def resnet_data():
    """16 x 16 RGB images of values 0 to 255 and 3 classes."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(NUM_SAMPLES, 16, 16, 3)).astype("float32")
    return images, rng.integers(0, 3, size=NUM_SAMPLES).astype("int32")


def make_resnet_classifier():
    import keras_hub

    keras.utils.set_random_seed(0)
    # keras-hub requires 64 filters in the first stack; one block of it.
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64],
        stackwise_num_blocks=[1],
        stackwise_num_strides=[1],
        block_type="basic_block",
        image_shape=(16, 16, 3),
    )
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(
        image_converter=keras_hub.layers.ResNetImageConverter(image_size=(16, 16), scale=1 / 255.0)
    )
    model = keras_hub.models.ResNetImageClassifier(
        backbone, num_classes=3, preprocessor=preprocessor
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def text_data():
    """Reviews as raw strings, shape `(n, 1)` as keras.io's text models take them."""
    rng = np.random.default_rng(4)
    words = rng.choice(TEXT_WORDS, size=(NUM_SAMPLES, 6))
    reviews = np.array([[" ".join(row)] for row in words])
    positive = np.isin(words, ["great", "fine", "good"]).sum(axis=1)
    negative = np.isin(words, ["bad", "awful", "poor"]).sum(axis=1)
    return reviews, (positive > negative).astype("float32").reshape(-1, 1)


def make_text_classifier():
    """keras.io's "text classification from scratch", tiny: `TextVectorization` in the model."""
    keras.utils.set_random_seed(0)
    reviews, _ = text_data()
    vectorize = keras.layers.TextVectorization(
        max_tokens=len(TEXT_WORDS) + 2, output_sequence_length=SEQUENCE_LENGTH
    )
    vectorize.adapt(reviews[:, 0])
    inputs = keras.Input(shape=(1,), dtype="string")
    x = keras.layers.Embedding(len(TEXT_WORDS) + 2, 8)(vectorize(inputs))
    x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.Conv1D(8, 3, activation="relu")(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


# name -> (model builder, data, the ReplicaSyncCheck per_replica_state):
# BatchNormalization's moving statistics are per-replica state, which
# "average" makes equal at each check.
MODELS = {
    "bert_classifier": (make_bert_classifier, bert_data, "warn"),
    "gpt2_causal_lm": (make_gpt2_causal_lm, gpt2_data, "warn"),
    "resnet_classifier": (make_resnet_classifier, resnet_data, "average"),
    "text_vectorization": (make_text_classifier, text_data, "warn"),
}


@dataclasses.dataclass
class Run:
    """What one training run left: the model, its logs and the callbacks' findings."""

    model: keras.Model
    history: dict
    sync_report: "keras_scaling.replica_state.ReplicaSyncReport"
    plan: "keras_scaling.data.InputPlan"
    log_dir: str
    iterations: int

    def throughput_record(self):
        with open(os.path.join(self.log_dir, "throughput.json")) as file:
            return json.load(file)


def distributed(data, strategy):
    return keras_scaling.data.distribute(
        data, strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE, seed=DATA_SEED
    )


def build(name, strategy):
    make_model, _, _ = MODELS[name]
    with strategy.scope():
        return make_model()


def train(name, strategy, log_dir, *, callbacks=()):
    """Builds model `name` under `strategy` and trains it on 2 epochs of its data."""
    _, make_data, per_replica_state = MODELS[name]
    model = build(name, strategy)
    train_data = distributed(make_data(), strategy)
    sync = keras_scaling.ReplicaSyncCheck(
        every_n_steps=4, log_dir=log_dir, per_replica_state=per_replica_state
    )
    # No baseline: timing a one-replica copy of each model would double the run.
    throughput = keras_scaling.ThroughputLogger(
        log_dir, baseline=None, update_freq=2, warmup_steps=2
    )
    history = model.fit(
        train_data, epochs=EPOCHS, verbose=0, callbacks=[*callbacks, sync, throughput]
    )
    return Run(
        model=model,
        history=history.history,
        sync_report=sync.last_report,
        plan=keras_scaling.data.plan_of(train_data),
        log_dir=log_dir,
        iterations=int(model.optimizer.iterations.numpy()),
    )


def variable_values(model):
    """Every model and optimizer variable's value, in order."""
    return [np.asarray(v.numpy()) for v in model.variables + model.optimizer.variables]
