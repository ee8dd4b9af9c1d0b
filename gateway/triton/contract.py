"""The TensorRT-LLM ensemble's tensor contract, read from the model's own config at start-up.

Names drift between TensorRT-LLM versions (`random_seed` -> `seed`, `min_length` -> `min_tokens`,
newer optional tensors); the gateway sends only what the model declares, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

# Ensemble inputs.
TEXT_INPUT = "text_input"
MAX_TOKENS = "max_tokens"
STREAM = "stream"
END_ID = "end_id"
PAD_ID = "pad_id"
STOP_WORDS = "stop_words"
TOP_K = "top_k"
TOP_P = "top_p"
TEMPERATURE = "temperature"
LENGTH_PENALTY = "length_penalty"
REPETITION_PENALTY = "repetition_penalty"
PRESENCE_PENALTY = "presence_penalty"
FREQUENCY_PENALTY = "frequency_penalty"
MIN_TOKENS_NAMES = ("min_tokens", "min_length")
SEED_NAMES = ("seed", "random_seed")
BEAM_WIDTH = "beam_width"
NUM_RETURN_SEQUENCES = "num_return_sequences"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"

# Ensemble outputs.
TEXT_OUTPUT = "text_output"
OUTPUT_IDS = "output_ids"
SEQUENCE_LENGTH = "sequence_length"
SEQUENCE_INDEX = "sequence_index"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"

REQUIRED_INPUTS = (TEXT_INPUT, MAX_TOKENS)

_NP_DTYPES: dict[int, type[np.generic]] = {
    mc.TYPE_BOOL: np.bool_,
    mc.TYPE_INT32: np.int32,
    mc.TYPE_INT64: np.int64,
    mc.TYPE_UINT64: np.uint64,
    mc.TYPE_FP32: np.float32,
    mc.TYPE_FP16: np.float16,
    mc.TYPE_STRING: np.object_,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    triton_dtype: str
    np_dtype: type[np.generic]


@dataclass(frozen=True, slots=True)
class EnsembleContract:
    model: str
    decoupled: bool
    inputs: dict[str, TensorSpec]
    outputs: frozenset[str]
    seed_input: str | None
    min_tokens_input: str | None

    @property
    def exposes_token_ids(self) -> bool:
        return OUTPUT_IDS in self.outputs

    @property
    def native_num_sequences(self) -> bool:
        return NUM_RETURN_SEQUENCES in self.inputs and SEQUENCE_INDEX in self.outputs

    @property
    def reports_token_counts(self) -> bool:
        return NUM_OUTPUT_TOKENS in self.outputs and RETURN_NUM_OUTPUT_TOKENS in self.inputs

    @property
    def variant(self) -> str:
        if self.seed_input == "random_seed" or self.min_tokens_input == "min_length":
            return "legacy"
        return "current"


class ContractError(ValueError):
    """The model does not look like a TensorRT-LLM ensemble the gateway can drive."""


def _dtype_name(code: int) -> str:
    return str(mc.DataType.Name(code)).removeprefix("TYPE_").replace("STRING", "BYTES")


def read_contract(config: mc.ModelConfig) -> EnsembleContract:
    inputs = {
        i.name: TensorSpec(i.name, _dtype_name(i.data_type), _NP_DTYPES.get(i.data_type, np.object_))
        for i in config.input
    }
    outputs = frozenset(o.name for o in config.output)
    missing = [name for name in REQUIRED_INPUTS if name not in inputs]
    if missing:
        raise ContractError(
            f"model {config.name!r} has no input(s) {', '.join(missing)}: not a TensorRT-LLM ensemble"
        )
    if TEXT_OUTPUT not in outputs and OUTPUT_IDS not in outputs:
        raise ContractError(f"model {config.name!r} has neither {TEXT_OUTPUT} nor {OUTPUT_IDS} as output")
    return EnsembleContract(
        model=config.name,
        decoupled=bool(config.model_transaction_policy.decoupled),
        inputs=inputs,
        outputs=outputs,
        seed_input=next((n for n in SEED_NAMES if n in inputs), None),
        min_tokens_input=next((n for n in MIN_TOKENS_NAMES if n in inputs), None),
    )
