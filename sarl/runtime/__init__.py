"""The low-level run machinery: run directories and their record (`runs`), the paper rows (`rows`), user errors and
exit codes (`errors`), signals and child process groups (`signals`), networking and the HTTP client (`network`,
`http_client`), the config folder and paths and JSONL inputs named in config (`files`), model configs (`models`),
the parts of a GPU memory plan (`memory`) and preflight check results (`checks`). Imports nothing else of the
project."""
