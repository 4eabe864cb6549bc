"""HW-GPT-Bench's published perplexities as this project's perplexity tables.

Where the files are is :mod:`hwgptbench.hwgpt_source` (repository, revision, files of each
scale); ``unpickle.py`` is a pickle reader that refuses every global, ``fetch.py`` the
``dvc import`` of the files, ``convert.py`` the files as a perplexity table and an import
report, ``commands.py`` the ``hwgptbench fetch-hwgptbench`` and ``hwgptbench import-perplexity``
subcommands.
"""
