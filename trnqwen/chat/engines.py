"""Which engine a ``trnqwen chat`` command line asks for, checked before any model loads.

``--endpoint URL``: the server answers (:mod:`trnqwen.chat.endpoint`); a RUN|FOLDER beside it is
refused (the server serves its own model: ``--model`` picks one).  Otherwise RUN|FOLDER is resolved
as ``eval``, ``serve`` and ``push`` resolve it (:func:`trnqwen.evaluate.targets.resolve_target`: a run
id, a run directory, an export folder; none: the last run's export; a LoRA adapter on its base) and
loaded here (:mod:`trnqwen.chat.local`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Union

from trnqwen.errors import UsageError

if TYPE_CHECKING:
    from trnqwen.chat.endpoint import EndpointEngine
    from trnqwen.chat.local import LocalEngine
    from trnqwen.evaluate.targets import EvalTarget


def open_engine(target: Optional[str], *, runs_dir: Path, endpoint: Optional[str] = None, model: Optional[str] = None,
                base: Optional[Path] = None, device: str = "auto", trust_remote_code: bool = False,
                on_load: Optional[Callable[[EvalTarget], None]] = None) -> Union[LocalEngine, EndpointEngine]:
    if endpoint:
        if target is not None:
            raise UsageError(f"RUN|FOLDER ({target}) and --endpoint: the endpoint answers with the model it serves",
                             hint="drop one; --model NAME picks among the endpoint's models")
        if base is not None:
            raise UsageError("--base applies to a LoRA adapter loaded here, not to --endpoint", hint="drop --base")
        from trnqwen.chat.endpoint import open_endpoint

        return open_endpoint(endpoint, model=model)
    if model is not None:
        raise UsageError("--model names a model of an --endpoint", hint="pass RUN|FOLDER to chat with an export here")
    from trnqwen.chat.local import open_local
    from trnqwen.ckpt.generate import detect_device_type
    from trnqwen.evaluate.targets import resolve_target

    resolved = resolve_target(target, runs_dir, base_dir=base, base_flag="--base")
    return open_local(resolved, device_type=detect_device_type(device), trust_remote_code=trust_remote_code,
                      on_load=on_load)
