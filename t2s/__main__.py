from t2s.cli import main

raise SystemExit(main())
