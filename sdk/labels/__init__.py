"""Labels: what a model's capability on each query was measured to be.

:func:`harvest` samples k answers per query and grades them (µ̂ = correct / k) into a labelled
JSONL file, resumably; :func:`capgate.labels.harvest_ray.ray_harvest` spreads the same harvest
over a Ray cluster; :func:`read_labelled` reads a labelled file back.
"""

from capgate.labels.harvesting import HarvestReport, aharvest, harvest, meta_path, prompt_with_confidence_tag
from capgate.labels.labelled import LabelledSet, iter_labelled, read_labelled

__all__ = [
    "HarvestReport",
    "LabelledSet",
    "aharvest",
    "harvest",
    "iter_labelled",
    "meta_path",
    "prompt_with_confidence_tag",
    "read_labelled",
]
