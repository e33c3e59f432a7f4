"""echorl envs as services: :mod:`~echorl_envs.service.server` serves every id over OpenEnv (``echorl serve-env``;
needs the ``openenv`` extra) and :mod:`~echorl_envs.service.remote` is ``EchoRL/Remote-v0``, the client env that
plays a served id as a local Gymnasium text env. Nothing is imported here: the server's dependencies are optional.
"""
