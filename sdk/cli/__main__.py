from capgate.cli import main

main()
