from t2s.commands import main

raise SystemExit(main())
