"""The whole params document as one typed model: its sections, the paper's and the cluster's
settings, and the problems between sections. :func:`hwgptbench.params.load_typed` builds it
from params.yaml and its overlays; every section's default is params.yaml's value."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from .compress import CompressSettings, ExportSettings
from .fields import Model, Name, doc
from .problems import ParamsError, Problems
from .sections import (
    SPACES,
    ClusterSettings,
    DataSettings,
    MeasureSettings,
    PaperSettings,
    PerplexitySettings,
    RuntimeSettings,
    SampleSettings,
    SearchSettings,
    SpaceSettings,
    SupernetSettings,
    SurrogateSettings,
    TransferSettings,
    WorkflowSettings,
)


class Params(Model):
    """params.yaml: every section, each defaulting to params.yaml's values."""

    data: DataSettings = DataSettings()
    workflow: WorkflowSettings = WorkflowSettings()
    spaces: Annotated[dict[Name, SpaceSettings], Field(min_length=1)] = doc(
        SPACES, "search spaces by name; the paper's are s, m, l; tiny runs on a 2-core CPU")
    supernet: SupernetSettings = SupernetSettings()
    sample: SampleSettings = SampleSettings()
    perplexity: PerplexitySettings = PerplexitySettings()
    measure: MeasureSettings = MeasureSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    surrogate: SurrogateSettings = SurrogateSettings()
    transfer: TransferSettings = TransferSettings()
    search: SearchSettings = SearchSettings()
    compress: CompressSettings = CompressSettings()
    export: ExportSettings = ExportSettings()
    paper: PaperSettings = PaperSettings()
    cluster: ClusterSettings = ClusterSettings()

    @model_validator(mode="after")
    def _imported_perplexities(self) -> Params:
        """What ``perplexity.source: hwgptbench`` cannot serve (when both sections are read)."""
        from ..hwgpt_source import FILES

        given = self.model_fields_set
        if "perplexity" not in given or self.perplexity.source != "hwgptbench":
            return self
        problems = Problems()
        other = [scale for scale in self.workflow.scales if scale not in FILES]
        if "workflow" in given and other:
            problems.add("workflow.scales", f"{other} have no published perplexities; with "
                         f"perplexity.source hwgptbench the scales are among {', '.join(FILES)} "
                         "(or set perplexity.source: supernet to train their supernets)")
        if "search" in given and "moasha" in self.search.algorithms:
            problems.add("search.algorithms", "moasha needs perplexities at several training "
                         "steps, and HW-GPT-Bench published one per arch: remove moasha with "
                         "perplexity.source hwgptbench")
        problems.raise_any()
        return self

    def space(self, scale: str) -> SpaceSettings:
        """The search space of ``scale``; a scale the params do not define is refused."""
        if scale not in self.spaces:
            raise ParamsError(f"unknown scale '{scale}'; the params define the spaces "
                              f"{', '.join(self.spaces)}")
        return self.spaces[scale]
