from tokenmill.cli import console_main

console_main()
