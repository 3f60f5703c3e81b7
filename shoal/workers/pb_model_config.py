"""``pb_utils.ModelConfig``: what a Python model's ``auto_complete_config`` gets and returns.

Triton's Python backend calls the static method ``TritonPythonModel.auto_complete_config(
auto_complete_model_config)`` at load, before ``initialize``, when auto-complete is on (no
``--disable-auto-complete-config``); it must return the object, which then holds the
completed config. The object holds the config as Triton's JSON (``as_dict()``, read-only
but for these setters), and the setters refuse, in Triton's words, what would contradict
the config file:

* ``set_max_batch_size(n)``: not below what the config sets;
* ``set_dynamic_batching()``: not with ``sequence_batching`` or ``ensemble_scheduling``;
* ``add_input({name, data_type, dims[, optional]})`` and ``add_output({name, data_type,
  dims})``: no other keys, none missing; a tensor the config lists already must agree on
  data type (unless TYPE_INVALID there) and dims (unless empty there);
* ``set_model_transaction_policy({"decoupled": b})``: no other keys, and not changing a
  ``decoupled`` the config sets.

Their refusals are ValueErrors; the model fails to load with the message.
"""

from __future__ import annotations

import json
from typing import Any


class ModelConfig:
    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name
        if any(key not in allowed for key in tensor):
            names = ", ".join(f"'{a}'" for a in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(
                f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for "
                f"model '{model}' contains property other than {names}."
            )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{model}' is missing '{key}' property."
                )
        tensors: list[dict[str, Any]] = self._model_config.setdefault(kind, [])
        for current in tensors:
            if current.get("name") != tensor["name"]:
                continue
            have = current.get("data_type", "TYPE_INVALID")
            if have != "TYPE_INVALID" and have != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {have} "
                    f"for {kind} '{tensor['name']}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current['dims'])}"
                )
            if current.get("optional", tensor.get("optional")) != tensor.get(
                "optional", current.get("optional")
            ):
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects "
                    f"optional {tensor['optional']} but the model configuration "
                    f"specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        tensors.append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._name
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{model}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{model}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
