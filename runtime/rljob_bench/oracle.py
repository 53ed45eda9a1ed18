"""A length predictor that knows each output's length: that of the row's reference
answer (and its end token), what a perfect ranker would know of a task whose output
is its answer. `rljob bench optimisations` runs skew-aware dispatch with it beside
the online ranker (`rollout.lengthPredictor: rljob_bench.oracle:AnswerLength`)."""

from __future__ import annotations

from rljob.workflow.lengths import LengthPredictor


class AnswerLength(LengthPredictor):
    def predict(self, prompts: list[str], answers: list[str]) -> list[int]:
        return [len(self.tok.encode(a, add_special_tokens=False)) + 1 for a in answers]
