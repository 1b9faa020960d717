"""Framework integrations: Hugging Face `transformers.Trainer` (`.hf`) and Lightning (`.lightning`).

Each submodule imports its framework; this package imports none, so `import ftsup.trainer` and
`import ftsup.trainer.integrations` stay free of transformers and lightning (the extras
`ftsup[hf]` and `ftsup[lightning]` install them). Both speak to the agent through today's
`Session` by way of one adapter per framework (`capture`/`restore` in each module) and the
helpers in `.state`, so a change of the state API touches those functions only.
"""
