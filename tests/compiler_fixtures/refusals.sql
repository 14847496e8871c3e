-- Views the compiler must refuse. Each case: a line "-- ErrorClass: message fragment", then the
-- SELECT of the view up to a ";" at the end of a line. The test wraps it in
-- CREATE MATERIALIZED VIEW v AS ... and checks the exact error class and the fragment.

-- joins
-- InvalidArgument: a LEFT JOIN's ON other than equalities of its table's columns with tables joined before it
SELECT count(*) FROM events e LEFT JOIN products p ON e.prod_id = p.prod_id AND p.price > e.cost;
-- InvalidArgument: a LEFT JOIN's ON other than equalities
SELECT count(*) FROM events e LEFT JOIN products p ON e.prod_id = p.prod_id AND e.shop_id = 1;
-- InvalidArgument: a LEFT JOIN's ON other than equalities
SELECT count(*) FROM events e LEFT JOIN products p ON e.prod_id = p.prod_id LEFT JOIN shops s ON s.shop_id = p.prod_id;
-- InvalidArgument: a LEFT JOIN needs ON
SELECT count(*) FROM events e LEFT JOIN products p;
-- InvalidArgument: LEFT JOIN ... USING or NATURAL LEFT JOIN
SELECT count(*) FROM events e LEFT JOIN products p USING (prod_id);
-- InvalidArgument: a RIGHT JOIN after another join (write it as a LEFT JOIN)
SELECT count(*) FROM events e JOIN shops s ON e.shop_id = s.shop_id RIGHT JOIN products p ON e.prod_id = p.prod_id;
-- InvalidArgument: SELECT * over a RIGHT JOIN
SELECT * FROM events e RIGHT JOIN products p ON e.prod_id = p.prod_id;
-- InvalidArgument: a FULL JOIN beside other joins (only a FULL JOIN of two tables: join the others in a subquery)
SELECT count(*) FROM events e FULL OUTER JOIN products p ON e.prod_id = p.prod_id JOIN shops s ON e.shop_id = s.shop_id;
-- InvalidArgument: a FULL JOIN's ON other than equalities of a column of each table
SELECT count(*) FROM events e FULL JOIN products p ON e.prod_id = p.prod_id AND p.price > 1;
-- InvalidArgument: FULL JOIN ... USING or NATURAL FULL JOIN
SELECT count(*) FROM events e FULL JOIN products p USING (prod_id);
-- InvalidArgument: CROSS JOIN takes no ON or USING
SELECT count(*) FROM events e CROSS JOIN products p ON e.prod_id = p.prod_id;
-- InvalidArgument: CROSS JOIN takes no ON or USING
SELECT count(*) FROM events NATURAL CROSS JOIN products;
-- UnknownColumn: USING (cat_id): no table before products has a column 'cat_id'
SELECT count(*) FROM events JOIN products USING (cat_id);
-- InvalidArgument: USING (name) is ambiguous: p.name, s.name
SELECT count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id JOIN shops s ON e.shop_id = s.shop_id JOIN categories USING (name);
-- InvalidArgument: NATURAL JOIN takes no ON or USING
SELECT count(*) FROM events NATURAL JOIN products USING (prod_id);
-- InvalidArgument: SEMI JOIN
SELECT count(*) FROM events e SEMI JOIN products p ON e.prod_id = p.prod_id;
-- UnknownColumn: unknown column s.shop_id (table products has no column 'shop_id')
SELECT count(*) FROM events e CROSS JOIN products s WHERE e.shop_id < s.shop_id;
-- TypeMismatch: cannot compare
SELECT count(*) FROM events e JOIN products p ON e.prod_id < p.name;
-- InvalidArgument: a UNION ALL branch without FROM
SELECT count(*) FROM events e CROSS JOIN (SELECT prod_id FROM products UNION SELECT 1) p;
-- InvalidArgument: INTERSECT in FROM
SELECT count(*) FROM events e CROSS JOIN (SELECT prod_id FROM products INTERSECT SELECT 1) p;
-- InvalidArgument: a LEFT JOIN's ON other than equalities
SELECT count(*) FROM events e CROSS JOIN products p LEFT JOIN shops s ON e.shop_id < s.shop_id;
-- UnknownColumn: unknown table alias 'c'
SELECT count(*) FROM events e JOIN products p ON c.cat_id = p.cat_id JOIN categories c ON p.cat_id = c.cat_id;
-- TypeMismatch: join condition e.cost = p.prod_id compares DECIMAL(10,2) with INT
SELECT count(*) FROM events e JOIN products p ON e.cost = p.prod_id;
-- InvalidArgument: table alias events is used twice
SELECT count(*) FROM events, events;
-- InvalidArgument: table alias e is used twice
SELECT count(*) FROM events e JOIN products e ON e.prod_id = e.prod_id;
-- InvalidArgument: a table qualified by schema
SELECT count(*) FROM shop.events;
-- InvalidArgument: column aliases on a table
SELECT count(*) FROM events AS e(a, b);

-- subqueries, set operations, clauses a view cannot have
-- InvalidArgument: a subquery in FROM needs an alias
SELECT count(*) FROM (SELECT * FROM events);
-- InvalidArgument: column aliases on a subquery in FROM
SELECT count(*) FROM (SELECT prod_id FROM events) AS s(p);
-- InvalidArgument: NOT IN over a grouped subquery
SELECT count(*) FROM events WHERE prod_id NOT IN (SELECT cat_id FROM products GROUP BY cat_id);
-- InvalidArgument: NOT IN of an expression or correlated with one
SELECT count(*) FROM events WHERE prod_id + 1 NOT IN (SELECT prod_id FROM products);
-- InvalidArgument: NOT EXISTS over a grouped subquery
SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT cat_id FROM products p WHERE p.prod_id = e.prod_id GROUP BY cat_id);
-- InvalidArgument: NOT EXISTS correlated with an expression
SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM products p WHERE p.prod_id = e.prod_id + 1);
-- InvalidArgument: NOT IN (SELECT ...) under OR or an expression (only as a conjunct of WHERE)
SELECT count(*) FROM events WHERE shop_id = 1 OR prod_id NOT IN (SELECT prod_id FROM products);
-- InvalidArgument: IN (SELECT ...) under OR, NOT or an expression
SELECT count(*) FROM events WHERE shop_id = 1 OR prod_id IN (SELECT prod_id FROM products);
-- InvalidArgument: EXISTS under OR, NOT or an expression
SELECT count(*) FROM events e WHERE shop_id = 1 OR EXISTS (SELECT 1 FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: a subquery correlated by a condition other than an equality
SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM products p WHERE p.price < e.cost);
-- InvalidArgument: a subquery correlated by <> without an equality
SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM products p WHERE p.prod_id <> e.prod_id);
-- InvalidArgument: a subquery correlated by a condition other than an equality
SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM products p WHERE p.prod_id = e.prod_id AND p.cat_id <> e.shop_id AND p.price <> e.cost);
-- InvalidArgument: a subquery correlated by a condition other than an equality
SELECT count(*) FROM events e WHERE e.cost > (SELECT max(price) FROM products p WHERE p.prod_id = e.prod_id AND p.cat_id <> e.shop_id);
-- InvalidArgument: a subquery correlated outside its WHERE
SELECT count(*) FROM events e WHERE EXISTS (SELECT e.cost FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: EXISTS over a grouped subquery
SELECT count(*) FROM events e WHERE EXISTS (SELECT cat_id FROM products p WHERE p.prod_id = e.prod_id GROUP BY cat_id);
-- InvalidArgument: IN over a grouped subquery correlated with the outer query
SELECT count(*) FROM events e WHERE e.cost IN (SELECT max(price) FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: IN (SELECT ...) needs a SELECT of one column
SELECT count(*) FROM events e WHERE e.prod_id IN (SELECT prod_id, cat_id FROM products);
-- InvalidArgument: a correlated COUNT subquery (over no rows it is 0, which needs an outer join)
SELECT count(*) FROM events e WHERE e.shop_id < (SELECT count(*) FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: a correlated scalar subquery other than SUM, AVG, MIN or MAX, or arithmetic over them
SELECT count(*) FROM events e WHERE e.cost < (SELECT coalesce(max(price), 0) FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: a correlated scalar subquery outside a comparison in WHERE's conjunction
SELECT count(*) FROM events e WHERE e.cost < 1 OR e.cost > (SELECT max(price) FROM products p WHERE p.prod_id = e.prod_id);
-- InvalidArgument: a scalar subquery with GROUP BY or HAVING
SELECT count(*) FROM events e WHERE e.cost > (SELECT max(price) FROM products GROUP BY cat_id);
-- InvalidArgument: a scalar subquery without an aggregate (it may give more than one row)
SELECT count(*) FROM events e WHERE e.cost > (SELECT price FROM products WHERE prod_id = 1);
-- InvalidArgument: a subquery in SELECT, ON or GROUP BY (only in FROM, WHERE and HAVING)
SELECT (SELECT count(*) FROM products), count(*) FROM events;
-- InvalidArgument: an unnamed expression beside a subquery in HAVING (name it: ... AS name)
SELECT count(*) FROM events HAVING count(*) > (SELECT count(*) FROM products);
-- InvalidArgument: a correlated subquery in HAVING
SELECT shop_id, sum(cost) AS c FROM events e GROUP BY shop_id HAVING sum(cost) > (SELECT max(price) FROM products p WHERE p.prod_id = e.shop_id);
-- InvalidArgument: a subquery in SELECT, ON or GROUP BY (only in FROM, WHERE and HAVING)
SELECT count(*) FROM events e JOIN products p ON p.prod_id = e.prod_id AND p.price > (SELECT avg(cost) FROM events);
-- InvalidArgument: window function
SELECT shop_id, sum(cost) OVER (PARTITION BY shop_id) FROM events;
-- InvalidArgument: window function
SELECT rank() OVER (ORDER BY cost), count(*) FROM events;
-- InvalidArgument: ORDER BY
SELECT shop_id, count(*) FROM events GROUP BY shop_id ORDER BY shop_id;
-- InvalidArgument: LIMIT
SELECT shop_id, count(*) FROM events GROUP BY shop_id LIMIT 10;
-- InvalidArgument: OFFSET
SELECT shop_id, count(*) FROM events GROUP BY shop_id OFFSET 10;
-- InvalidArgument: LIMIT is not supported in a materialized view: SELECT prod_id FROM products
SELECT count(*) FROM events WHERE prod_id IN (SELECT prod_id FROM products ORDER BY price LIMIT 3);
-- InvalidArgument: LIMIT is not supported in a materialized view: SELECT 1 FROM products
SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM products p WHERE p.prod_id = e.prod_id LIMIT 0);
-- InvalidArgument: OFFSET is not supported in a materialized view: SELECT MAX(price) FROM products
SELECT shop_id, sum(cost) FROM events GROUP BY shop_id HAVING sum(cost) > (SELECT MAX(price) FROM products OFFSET 1);
-- InvalidArgument: FETCH is not supported in a materialized view
SELECT count(*) FROM events WHERE prod_id NOT IN (SELECT prod_id FROM products FETCH FIRST 2 ROWS ONLY);
-- InvalidArgument: LIMIT is not supported in a materialized view
WITH cheap AS (SELECT prod_id FROM products LIMIT 5) SELECT count(*) FROM events WHERE prod_id IN (SELECT prod_id FROM cheap);
-- InvalidArgument: SELECT DISTINCT over aggregates is supported only when the SELECT shows every GROUP BY column
SELECT DISTINCT count(*) FROM events GROUP BY shop_id;
-- InvalidArgument: SELECT DISTINCT ON
SELECT DISTINCT ON (shop_id) shop_id, cost FROM events;
-- InvalidArgument: UNION without ALL of queries with aggregates
SELECT count(*) FROM events UNION SELECT count(*) FROM products;
-- InvalidArgument: UNION without ALL beside UNION ALL
SELECT prod_id FROM events UNION SELECT prod_id FROM products UNION ALL SELECT cat_id FROM products;
-- InvalidArgument: an aggregate without GROUP BY as a branch of a top-level UNION ALL
SELECT count(*) FROM events UNION ALL SELECT count(*) FROM products;
-- InvalidArgument: UNION ALL of a query with aggregates and one without
SELECT shop_id, count(*) FROM events GROUP BY shop_id UNION ALL SELECT shop_id, prod_id FROM products;
-- InvalidArgument: a UNION ALL branch in FROM with aggregates, GROUP BY or DISTINCT
SELECT count(*) FROM (SELECT prod_id FROM events GROUP BY prod_id UNION ALL SELECT prod_id FROM products) u;
-- InvalidArgument: INTERSECT
SELECT count(*) FROM events INTERSECT SELECT count(*) FROM products;
-- InvalidArgument: EXCEPT
SELECT count(*) FROM events EXCEPT SELECT count(*) FROM products;
-- InvalidArgument: WITH RECURSIVE
WITH RECURSIVE x AS (SELECT * FROM events) SELECT count(*) FROM x;
-- InvalidArgument: a column list on a common table expression
WITH x(n) AS (SELECT id FROM events) SELECT count(*) FROM x;
-- InvalidArgument: SELECT * is not supported in a view with GROUP BY or aggregates
SELECT *, count(*) FROM events;
-- InvalidArgument: SELECT e.*
SELECT e.*, count(*) FROM events e;
-- InvalidArgument: a SELECT without FROM and without a subquery
SELECT count(*);
-- InvalidArgument: a SELECT without FROM and without a subquery
SELECT 1 AS one;
-- InvalidArgument: a scalar subquery with GROUP BY or HAVING
SELECT (SELECT count(*) FROM events GROUP BY shop_id) AS n;
-- InvalidArgument: a materialized view needs a SELECT
INSERT INTO events VALUES (1);

-- conditions
-- InvalidArgument: BETWEEN SYMMETRIC
SELECT count(*) FROM events WHERE shop_id BETWEEN SYMMETRIC 5 AND 1;
-- InvalidArgument: IN without a list of values
SELECT count(*) FROM events WHERE shop_id IN ();
-- InvalidArgument: ILIKE (LIKE is supported) is not supported in a materialized view
SELECT count(*) FROM products WHERE name ILIKE 'a%';
-- InvalidArgument: LIKE ... ESCAPE is not supported
SELECT count(*) FROM products WHERE name LIKE 'a!%' ESCAPE '!';
-- InvalidArgument: LIKE with a pattern that is not a constant string is not supported
SELECT count(*) FROM products WHERE name LIKE name;
-- InvalidArgument: a backslash in a LIKE pattern
SELECT count(*) FROM products WHERE name LIKE 'a\%';
-- TypeMismatch: LIKE on INT, not TEXT
SELECT count(*) FROM events WHERE shop_id LIKE '1%';
-- InvalidArgument: IS other than IS [NOT] NULL
SELECT count(*) FROM events WHERE (cost > 0) IS TRUE;
-- InvalidArgument: NULL literal is not supported
SELECT count(*) FROM events WHERE shop_id BETWEEN NULL AND 3;
-- InvalidArgument: CASE whose every result is NULL
SELECT sum(CASE WHEN cost > 0 THEN NULL END) FROM events;
-- TypeMismatch: mixes TEXT with INT
SELECT count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id GROUP BY CASE WHEN cost > 0 THEN p.name ELSE 1 END;
-- TypeMismatch: mixes TEXT with DECIMAL
SELECT count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id WHERE coalesce(p.name, e.cost) = 'x';
-- InvalidArgument: a condition cannot be used as a value: cost > 0 OR shop_id = 1
SELECT sum(CASE WHEN true THEN cost > 0 OR shop_id = 1 END) FROM events;
-- InvalidArgument: NULL literal is not supported
SELECT count(*) FROM events WHERE cost = NULL;
-- InvalidArgument: operator %
SELECT count(*) FROM events WHERE shop_id % 2 = 0;
-- InvalidArgument: operator ||
SELECT count(*) FROM products WHERE name || 'x' = 'ax';
-- InvalidArgument: CAST
SELECT sum(CAST(cost AS INT)) FROM events;
-- InvalidArgument: a condition cannot be used as a value: cost > 0
SELECT sum(cost > 0) FROM events;
-- TypeMismatch: condition e.cost is DECIMAL(10,2), not BOOL
SELECT count(*) FROM events e WHERE e.cost;

-- functions and aggregates
-- InvalidArgument: unsupported function UPPER
SELECT upper(name), count(*) FROM products GROUP BY name;
-- InvalidArgument: unsupported function NULLIF
SELECT sum(nullif(cost, 0)) FROM events;
-- InvalidArgument: unsupported function STDDEV
SELECT stddev(cost) FROM events;
-- InvalidArgument: unsupported function MY_UDF
SELECT my_udf(cost), count(*) FROM events;
-- InvalidArgument: unsupported function EXTRACT(EPOCH FROM ...) in EXTRACT(EPOCH FROM ts) (EXTRACT takes YEAR, MONTH, DAY)
SELECT sum(EXTRACT(EPOCH FROM ts)) FROM events;
-- InvalidArgument: unsupported function EXTRACT(DOW FROM ...)
SELECT EXTRACT(DOW FROM ts) AS dow, count(*) FROM events GROUP BY 1;
-- InvalidArgument: unsupported function DATE_PART
SELECT count(*) FROM events WHERE date_part('year', ts) = 2024;
-- InvalidArgument: unsupported function LOWER
SELECT count(*) FROM products WHERE substring(lower(name), 1, 1) = 'a';
-- TypeMismatch: EXTRACT(YEAR FROM ...) of TEXT, not DATE: EXTRACT(YEAR FROM name)
SELECT EXTRACT(YEAR FROM name), count(*) FROM products GROUP BY 1;
-- TypeMismatch: ABS of TEXT, not a number: ABS(name)
SELECT sum(abs(name)) FROM products;
-- TypeMismatch: SUBSTRING of INT, not TEXT
SELECT substring(prod_id, 1) AS p, count(*) FROM products GROUP BY 1;
-- InvalidArgument: SUBSTRING with a start below 1 (PostgreSQL counts it before the string, duckdb and Spark from its end) is not supported in a materialized view: SUBSTRING(name, 0, 2)
SELECT substring(name, 0, 2) AS p, count(*) FROM products GROUP BY 1;
-- InvalidArgument: SUBSTRING with a start below 1
SELECT substring(name FROM -1) AS p, count(*) FROM products GROUP BY 1;
-- InvalidArgument: SUBSTRING with a negative length (an error in PostgreSQL, not in duckdb)
SELECT count(*) FROM products WHERE substring(name, 2, -1) = '';
-- InvalidArgument: SUBSTRING with a start or length that is not an integer constant
SELECT substring(name, prod_id, 2) AS p, count(*) FROM products GROUP BY 1;
-- InvalidArgument: SUBSTRING with a start or length that is not an integer constant
SELECT substring(name, 1, 2.0) AS p, count(*) FROM products GROUP BY 1;
-- TypeMismatch: GREATEST(cost, name) mixes DECIMAL(10,2) with TEXT
SELECT sum(greatest(cost, name)) FROM events e JOIN products p ON e.prod_id = p.prod_id;
-- InvalidArgument: GREATEST needs two arguments or more
SELECT sum(greatest(cost)) FROM events;
-- InvalidArgument: LEAST whose every result is NULL
SELECT count(*) FROM events WHERE least(NULL, NULL) > 1;
-- InvalidArgument: aggregate nested in an aggregate: SUM(MAX(cost))
SELECT sum(max(cost)) FROM events;
-- InvalidArgument: aggregate SUM(cost) in WHERE
SELECT count(*) FROM events WHERE sum(cost) > 0;
-- InvalidArgument: aggregate COUNT(*) in JOIN ... ON
SELECT count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id AND count(*) > 1;
-- InvalidArgument: aggregate SUM(cost) in GROUP BY
SELECT count(*) FROM events GROUP BY sum(cost);
-- InvalidArgument: SUM(DISTINCT ...)
SELECT sum(DISTINCT cost) FROM events;
-- InvalidArgument: AVG(DISTINCT ...)
SELECT avg(DISTINCT cost) FROM events;
-- InvalidArgument: COUNT(DISTINCT with several arguments)
SELECT count(DISTINCT shop_id, prod_id) FROM events;

-- select list and grouping
-- InvalidArgument: column p.name must appear in GROUP BY or be aggregated
SELECT p.name, count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id;
-- InvalidArgument: column p.name must appear in GROUP BY or be aggregated
SELECT p.name, count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id GROUP BY p.cat_id;
-- InvalidArgument: column e.cost in HAVING must appear in GROUP BY or be aggregated
SELECT shop_id, count(*) FROM events e GROUP BY shop_id HAVING e.cost > 1;
-- InvalidArgument: HAVING without an aggregate
SELECT shop_id FROM events GROUP BY shop_id HAVING shop_id > 1;
-- InvalidArgument: events.shop_id appears twice in the SELECT of a view without aggregates
SELECT shop_id, shop_id FROM events;
-- InvalidArgument: column events.cost in a SELECT expression must appear in GROUP BY or be aggregated
SELECT cost + sum(cost) FROM events;
-- InvalidArgument: a condition cannot be used as a value: SUM(cost) > 0
SELECT shop_id, sum(cost) > 0 FROM events GROUP BY shop_id;
-- InvalidArgument: aggregate nested in an aggregate
SELECT sum(cost) / sum(count(*)) FROM events;
-- InvalidArgument: column events.shop_id in a SELECT expression must appear in GROUP BY
SELECT shop_id + 1, count(*) FROM events GROUP BY shop_id + 2;
-- InvalidArgument: GROUP BY n refers to an aggregate: COUNT(*)
SELECT count(*) AS n FROM events GROUP BY n;
-- InvalidArgument: GROUP BY position 1 refers to an aggregate
SELECT count(*) + 1, count(*) FROM events GROUP BY 1;
-- InvalidArgument: ROLLUP is not supported
SELECT shop_id, count(*) FROM events GROUP BY ROLLUP (shop_id);
-- InvalidArgument: GROUP BY position 3 is not in the SELECT
SELECT shop_id, count(*) FROM events GROUP BY 3;
-- InvalidArgument: GROUP BY position 2 refers to an aggregate
SELECT shop_id, count(*) FROM events GROUP BY 2;
-- InvalidArgument: GROUP BY column events.shop_id appears twice in SELECT
SELECT shop_id AS a, shop_id AS b, count(*) FROM events GROUP BY shop_id;
-- InvalidArgument: output name n is used twice
SELECT count(*) AS n, sum(cost) AS n FROM events;
-- InvalidArgument: names starting with _ are reserved
SELECT count(*) AS _count FROM events;

-- names
-- UnknownTable: unknown table 'nosuch'
SELECT count(*) FROM nosuch;
-- UnknownTable: unknown table 'nosuch'
SELECT count(*) FROM events e JOIN nosuch n ON e.prod_id = n.prod_id;
-- UnknownColumn: unknown column e.price (table events has no column 'price')
SELECT sum(e.price) FROM events e;
-- UnknownColumn: unknown column nope
SELECT sum(nope) FROM events;
-- UnknownColumn: unknown table alias 'events' in events.cost
SELECT sum(events.cost) FROM events e;
-- InvalidArgument: column name is ambiguous: p.name, c.name
SELECT name, count(*) FROM products p JOIN categories c ON p.cat_id = c.cat_id GROUP BY name;
-- InvalidArgument: column prod_id is ambiguous: e.prod_id, p.prod_id
SELECT count(*) FROM events e JOIN products p ON e.prod_id = p.prod_id WHERE prod_id > 3;

-- types
-- TypeMismatch: SUM over TEXT column c.name
SELECT sum(c.name) FROM categories c;
-- TypeMismatch: AVG over DATE column events.ts
SELECT avg(ts) FROM events;
-- TypeMismatch: SUM over BOOL column f.ok
SELECT sum(f.ok) FROM flags f;
-- TypeMismatch: AVG over TEXT expression 'x'
SELECT avg('x') FROM products p;
-- TypeMismatch: cannot compare DATE with INT: ts > 5
SELECT count(*) FROM events WHERE ts > 5;
-- TypeMismatch: cannot compare TEXT with INT: name = 3
SELECT count(*) FROM products WHERE name = 3;
-- TypeMismatch: cannot compare TEXT with DECIMAL(10,2)
SELECT count(*) FROM products WHERE name BETWEEN price AND 3;
-- TypeMismatch: cannot compare INT with TEXT
SELECT count(*) FROM events WHERE shop_id IN (1, 'two');
-- TypeMismatch: cannot compare BOOL with INT
SELECT count(*) FROM flags WHERE ok = 1;
-- TypeMismatch: '2024-13-01' is not an ISO-8601 date
SELECT count(*) FROM events WHERE ts >= '2024-13-01';
-- TypeMismatch: 'yesterday' is not an ISO-8601 date
SELECT count(*) FROM events WHERE ts IN ('2024-01-01', 'yesterday');
-- TypeMismatch: 'soon' is not an ISO-8601 date
SELECT count(*) FROM events WHERE ts > DATE 'soon';
-- TypeMismatch: arithmetic + on TEXT and INT
SELECT count(*) FROM products WHERE name + 1 > 2;
-- TypeMismatch: arithmetic - on DATE and INT
SELECT count(*) FROM events WHERE ts - 1 > DATE '2024-01-01';
-- TypeMismatch: arithmetic * on BOOL and INT
SELECT sum(ok * 2) FROM flags;
-- TypeMismatch: unary minus on TEXT
SELECT count(*) FROM products WHERE -name = 'a';
-- TypeMismatch: would need DECIMAL scale 40, more than 38
SELECT sum(cost * 0.00000000000000000000000000000000000001) FROM events;
-- InvalidArgument: decimal literal 123456789012345678901234567890.123456789 has more than 38 digits
SELECT count(*) FROM events WHERE cost > 123456789012345678901234567890.123456789;
