"""The scheduling framework: one protocol per extension point (:mod:`.protocols`), plugin
parameters (:mod:`.params`), the registry (:mod:`.registry`), the staged config loader
(:mod:`.config` reads the document, :mod:`.loader` builds the plugins and profiles), the
scheduling profile (:mod:`.profile`), the scheduler (:mod:`.scheduler`) and the request
lifecycle (:mod:`.lifecycle`). It imports no plugin: plugins are found by type name through
the registry."""
