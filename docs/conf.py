"""Sphinx configuration of loco's documentation site.

  pip install -e '.[docs]' && sphinx-build -W -n -b html docs docs/_build/html

Warnings are errors and cross-references are checked (-W -n). The reference pages are
generated at build time (docs/_ext/loco_reference.py): the config keys from the schema,
the API from `loco.__all__`, each command's flags from its own parser.
"""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path[:0] = [ROOT, os.path.join(DOCS, '_ext')]

project = 'loco'
author = 'the loco authors'
copyright = '2026, the loco authors'   # pylint: disable=redefined-builtin
import loco  # noqa: E402  pylint: disable=wrong-import-position
release = version = loco.__version__

extensions = [
    'myst_nb',
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',
    'loco_reference',
]
root_doc = 'index'
exclude_patterns = ['_build', 'reference/_generated_*', '**/.ipynb_checkpoints',
                    'scaling/*.json']
suppress_warnings = []
smartquotes = False   # keys and values are shown as typed ('' stays '')

html_theme = 'sphinx_book_theme'
html_title = f'loco {release}'
html_theme_options = {
    'show_toc_level': 2,
    'use_download_button': True,
    'launch_buttons': {},
}
html_static_path = []

myst_enable_extensions = ['colon_fence', 'deflist', 'dollarmath']
myst_heading_anchors = 3
# Notebooks render with the outputs they were committed with (executed on a CPU; a slow
# test executes the notebook again).
nb_execution_mode = 'off'

autosummary_generate = True
autodoc_member_order = 'bysource'
autodoc_typehints = 'description'
autodoc_default_options = {'members': True, 'undoc-members': False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True      # a NamedTuple's Attributes: fields, not a second entry
templates_path = ['_templates']

# -n checks every cross-reference to loco's own objects; names of other libraries (JAX,
# optax, numpy, ...) have no local target and no network is used to fetch theirs.
nitpicky = True
nitpick_ignore_regex = [
    (r'py:.*', r'(jax|jaxlib|optax|flax|nnx|numpy|np|chex|ml_collections|config_dict|absl|'
               r'etils|epath|grain|tensorflow_datasets|matplotlib|collections|typing|'
               r'dataclasses|enum|os|pathlib|argparse|types|abc)(\..*)?'),
    (r'py:.*', r'(PyTree|Params|Array|ArrayTree|Any|Callable|Sequence|Mapping|Iterable|'
               r'Iterator|NoReturn|NamedTuple|Path|PRNGKey|Key|Shape|DType|DTypeLike|'
               r'ArrayLike|Updates|GradientTransformation|Schedule|ScalarOrSchedule)'),
    # Raises: sections name loco's errors bare (they are on the API page, loco.errors).
    (r'py:exc', r'[A-Z]\w*Error'),
    # A Returns: line read as a type ('[H] int32 ...', 'When the last piece is done').
    (r'py:class', r'(int32|float32|bool|[A-Z]|[^.]* [^.]*)'),
]

# The stable surface loads lazily (`loco.__getattr__`); resolve every name so that
# autodoc and autosummary see the objects themselves.
for _name in loco.__all__:
  getattr(loco, _name)

import loco_reference  # noqa: E402  pylint: disable=wrong-import-position
loco_reference.write_pages(DOCS)
