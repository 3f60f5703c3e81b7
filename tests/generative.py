"""Generative models for the tests: the stand-in (tests/generative_standin_model.py) with
the I/O of Triton's vLLM backend, written into a repository with a byte-level tokenizer
built here by ``tokenizers`` (each UTF-8 byte one token, as the stand-in counts them).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

STANDIN = Path(__file__).with_name("generative_standin_model.py")

#: The contract's optional inputs (all BOOL but sampling_parameters), and its outputs.
_OPTIONAL_INPUTS = ("stream", "exclude_input_in_output", "return_finish_reason",
                    "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
                    "return_num_output_tokens")  # fmt: skip
_OUTPUTS = {"finish_reason": "TYPE_STRING", "cumulative_logprob": "TYPE_FP32",
            "logprobs": "TYPE_STRING", "num_input_tokens": "TYPE_UINT32",
            "num_output_tokens": "TYPE_UINT32"}  # fmt: skip


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE with no merges: token id = the byte's value."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    by_byte = _bytes_to_unicode()
    vocab = {by_byte[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for bytes (what the ByteLevel pre-tokenizer writes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def write_standin(
    repo: Path,
    name: str,
    *,
    tokenizer: bool = True,
    template: str | None = None,
    outputs: tuple[str, ...] = tuple(_OUTPUTS),
    exclude_input: bool = True,
) -> None:
    """The stand-in as model ``name``: with the tokenizer parameter (``tokenizer``), a
    chat template file (``template``, else none: the API's default), the extra
    ``outputs`` named (their ``return_*`` inputs with them), and the
    ``exclude_input_in_output`` input (``exclude_input``; without it the model repeats
    the prompt first, the contract's default)."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    shutil.copy(STANDIN, version / "model.py")
    inputs = [
        '{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }',
        '{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }',
    ]
    for flag in _OPTIONAL_INPUTS:
        if flag == "exclude_input_in_output" and not exclude_input:
            continue
        if not flag.startswith("return_") or flag.removeprefix("return_") in outputs:
            inputs.append(f'{{ name: "{flag}" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}')
    outs = ['{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }']
    outs += [f'{{ name: "{o}" data_type: {_OUTPUTS[o]} dims: [ -1 ] }}' for o in outputs]
    params = []
    if tokenizer:
        byte_tokenizer().save(str(version / "tokenizer.json"))
        params.append('parameters { key: "tokenizer" value: { string_value: "tokenizer.json" } }')
    if template is not None:
        (repo / name / "chat_template.jinja").write_text(template)
        params.append(
            'parameters { key: "chat_template" value: { string_value: "chat_template.jinja" } }'
        )
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outs)} ]\n"
        + "\n".join(params)
        + "\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
