from astrasim.cli import main

raise SystemExit(main())
