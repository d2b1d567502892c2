"""Model converters that produce GGUF files for tests and local use.

Nothing here is imported by the serving path; the converters need the ``gguf``
package (and numpy), which the serving dependencies do not include.
"""
