from swarm_gdrive.cli import main

main()
