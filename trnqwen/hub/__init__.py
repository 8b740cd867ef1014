"""Publishing to the Hugging Face Hub: ``trnqwen push`` and ``train --push-to-hub`` (:mod:`trnqwen.hub.push`).

Above ``ckpt/`` (verify-ckpt's checks decide what may be published) and ``evaluate/`` (a RUN or
FOLDER argument is resolved as ``trnqwen eval`` resolves it); ``session/`` calls it after a run.
huggingface_hub is imported inside functions only.
"""
