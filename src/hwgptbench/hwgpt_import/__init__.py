"""HW-GPT-Bench's published perplexities as this project's perplexity tables.

``source.py`` where the files are (repository, revision, files of each scale), ``unpickle.py``
a pickle reader that refuses every global, ``fetch.py`` the ``dvc import`` of the files,
``convert.py`` the files as a perplexity table and an import report, ``commands.py`` the
``hwgptbench fetch-hwgptbench`` and ``hwgptbench import-perplexity`` subcommands.
"""

from ..errors import UserError


class PublishedDataError(UserError, RuntimeError):
    """HW-GPT-Bench's files could not be fetched, or are not what the import reads."""
