"""The settings each role's command line takes, beside the configuration code: ``common``
(every process), ``frontend`` and ``broker``. ``shoal serve`` takes them all and hands each
process its part."""
