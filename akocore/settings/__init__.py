"""Run settings: schema, key registry, layers with origins, TOML and command-line edges.

    normalise.py  human or typed value -> typed value, ConfigError naming the key
    schema.py     the frozen dataclasses (RunConfig and its sections, AkorunConfig);
                  every built-in default is a field default there
    key_registry.py  every key once: section, name, field, dump, comment, flag, tools;
                  a scheme's knobs generated from its settings class (schemes.knobs)
    layers.py     defaults < file < --set < flags -> ResolvedSettings with origins;
                  the stop rule (a duration without rounds clears rounds)
    toml_io.py    TOML files and --set items as layers; config_to_dict / hash
    cli_flags.py  argparse flags generated from the registry; resolve_args
    reference.py  the settings reference (Markdown) generated from the registry

Import each name from the module that owns it (there is no re-exporting module).
"""
