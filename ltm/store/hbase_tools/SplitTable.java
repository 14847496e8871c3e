// Splits an HBase table at a row key through HBase's Admin API, and waits until the table has
// more regions than before. Thrift1 has no split call; `StandaloneHBase.split` runs this file
// with `java` in source-file mode against the same jars and hbase-site.xml as the server.
// Usage: java -cp CONF:JARS SplitTable.java TABLE SPLIT_KEY_HEX

import java.util.HexFormat;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.ConnectionFactory;

public class SplitTable {
  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: SplitTable TABLE SPLIT_KEY_HEX");
      System.exit(2);
    }
    TableName table = TableName.valueOf(args[0]);
    byte[] splitKey = HexFormat.of().parseHex(args[1]);
    Configuration conf = HBaseConfiguration.create();
    try (Connection connection = ConnectionFactory.createConnection(conf);
        Admin admin = connection.getAdmin()) {
      int before = admin.getRegions(table).size();
      admin.split(table, splitKey);
      long deadline = System.currentTimeMillis() + 60_000;
      while (admin.getRegions(table).size() <= before) {
        if (System.currentTimeMillis() > deadline) {
          System.err.println("the split of " + table + " did not finish within 60 s");
          System.exit(1);
        }
        Thread.sleep(200);
      }
      System.out.println(admin.getRegions(table).size() + " regions");
    }
  }
}
