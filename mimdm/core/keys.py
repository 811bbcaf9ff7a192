"""The artifact keys that more than one module needs: one function each, so a changed hash input changes every
reader and writer at once (`mimdm.core.artifacts.artifact_dir` turns a key into a folder)."""
from __future__ import annotations

from pathlib import Path

from mimdm.core.artifacts import artifact_dir


def mi_head_dir(labels: Path, head_config: dict, train_config: dict, target: str = "mi", world_size: int = 1,
                create: bool = True) -> Path:
    """Folder of an MI head trained on the label set ``labels`` (its ``head.pt`` inside).

    Args:
        labels: the label set's folder (its name identifies the MDM and the label config).
        head_config, train_config: ``MIHeadConfig.to_dict()`` and ``HeadTrainConfig.to_dict()``.
        target: which labels the head learns (``"mi"``: the probed MI; others are ablations).
        world_size: processes that trained it; above 1 (DDP) the key holds it, since the weights differ slightly
            from a single-process run.
        create: False for a read-only lookup (nothing is written).
    """
    key = {"labels": Path(labels).name, "head": head_config, "train": train_config}
    if target != "mi":
        key["target"] = target
    if world_size > 1:
        key["ddp_world_size"] = world_size
    return artifact_dir("mi_head", Path(labels).name, key, create=create)


def protein_label_dir(model_key: str, data_id: str, label_config: dict, aligned: bool, create: bool = True) -> Path:
    """Folder of a protein MI label set of the model ``model_key`` on the family data ``data_id``.

    Args:
        label_config: ``AlignedLabelConfig.to_dict()`` (``aligned=True``, the aligned-column Potts MDM) or
            ``ProteinLabelConfig.to_dict()`` (the sequence MDM).
        create: False for a read-only lookup (nothing is written).
    """
    key = {"model": model_key, "data": data_id, **({"kind": "aligned"} if aligned else {}), **label_config}
    return artifact_dir("protein_labels", model_key, key, create=create)
