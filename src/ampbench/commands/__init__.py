"""The commands that are not stages of the study's pipeline (cli.COMMANDS names each): a module each,
parse -> call a capability -> exit status; the work is in the capability folders."""
