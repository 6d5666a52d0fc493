from recstream.cli.main import main

raise SystemExit(main())
