-- Version 2: an operator's note on a resolve (attempts.note). Applied
-- when the column is missing.
ALTER TABLE attempts ADD COLUMN note TEXT;
